"""The book's models, each one file on top of :mod:`lecture_pkg.layers`: only what is particular
to the model (embeddings, heads, position scheme, weight names) lives in its file."""
