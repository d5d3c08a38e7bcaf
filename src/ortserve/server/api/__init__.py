"""One thin adapter per wire API: parse and check the API's request, hand the shared layer
(server/conversation.py) an internal request, and render its events back in the API's own shape
and error format, streamed or not."""
