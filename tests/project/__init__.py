"""The repository's own rules: the layers, the package's shape, the tests' layout, the release."""
