"""One turn's pipeline: prompt and documents in, prefill phase, decode phase, text out."""
