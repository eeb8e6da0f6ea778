"""The Ray Serve deployments (ingress, engine) and what they share."""
