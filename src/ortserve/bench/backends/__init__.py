"""Backends: each loads one model and runs batches of prompts, reporting per-request timings.

A backend module defines ``Backend`` (see base.py). Modules are imported only inside the
worker subprocess that runs them, so torch or llama.cpp never load into ortserve itself.
"""
