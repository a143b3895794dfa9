"""The documentation site, and every example of README.md and docs/ run as written."""
