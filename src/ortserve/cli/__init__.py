"""The ortserve command line."""
