"""``POST /v1/responses``: one turn, from the door (`admission`: every 4xx) to its stored end."""
