"""The engine link: the engine deployment, the ingress's client of it, the channel between
them, and the engine's autoscaling policy."""
