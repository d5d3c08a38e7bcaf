"""Model store, catalog, conversion and quality measurement."""
