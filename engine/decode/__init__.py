"""Token loops: plain, compiled, dispatch-ahead, and the sampler they share."""
