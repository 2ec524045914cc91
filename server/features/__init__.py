"""LSP features, each a pure function from a cached report (and the document) to LSP objects."""
