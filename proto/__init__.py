"""Wire contract of vesper (package ``vesper.v1``) and its generated Python code."""
