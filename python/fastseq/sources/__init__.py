"""Where models come from: paths, bytes, ``ModelProto``, URLs, the Hugging Face Hub and
``builtin:`` operators, resolved to local bytes or a path for the core to read."""
