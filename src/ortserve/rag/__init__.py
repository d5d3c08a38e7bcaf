"""Offline retrieval: parsing, chunking, the embedded index, hybrid search (issue 16)."""
