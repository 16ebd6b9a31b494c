"""Generated code for ``vesper.v1``; regenerate with ``python -m vesper.proto.generate``."""
