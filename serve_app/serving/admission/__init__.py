"""The one door: every 4xx of the API is raised here. The request models (serve_app.protocol)
parse a body's shape and types; the rules in these modules judge it, and turn what other layers
find (a schema outside the strict subset, a grammar that does not compile) into the error.

- `responses`: ``POST /v1/responses`` (and ``/input_tokens``, ``/compact``), in the order
  serve_app.serving.turn.admit applies them;
"""
