"""Stored responses: what ``store: true`` keeps and ``previous_response_id`` continues."""
