"""Whisper import: CTranslate2 or Hugging Face Whisper into an og Whisper model, and its graph edits."""
