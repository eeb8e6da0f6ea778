"""Tools the server runs: the tool loop and its runners."""
