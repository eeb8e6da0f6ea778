"""Engines: token ids in, token ids out. See `base.Engine` for the contract."""
