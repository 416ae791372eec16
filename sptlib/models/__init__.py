"""Complete models: encoder -> backbone (stack of residual blocks) -> head."""
