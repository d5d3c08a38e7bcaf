"""Speculative decoding: the draft model's and prompt lookup's guesses, checked in one verify step."""
