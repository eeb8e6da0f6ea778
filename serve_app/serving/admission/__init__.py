"""The one door: every 4xx of the API is raised here. The request models (serve_app.protocol)
parse a body's shape and types; the rules in these modules judge it, and turn what other layers
find (a schema outside the strict subset, a grammar that does not compile) into the error.

- `responses`: ``POST /v1/responses`` (and ``/input_tokens``, ``/compact``), in the order the
  turn's door (serve_app.serving.turn.admit) applies them; the failed response's HTTP error;
- `tools`: tool calls and their outputs, ``tool_choice``, strict and enforceable schemas;
- `stored`: stored responses, conversations and items (404s), background-only actions, list
  cursors, served models;
- `websocket`: connection slots (429) and each ``response.create`` message;
- `access`: API keys (401).

Left to the transport: a body over the size limit, too slow or undecodable (413, 408, 400,
415, serve_app.serving.http.body_limit), answered before the body is parsed.
"""
