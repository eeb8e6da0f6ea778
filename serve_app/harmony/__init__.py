"""Translation between the Responses API and gpt-oss's harmony format, on token ids."""
