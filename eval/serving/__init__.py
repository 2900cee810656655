"""Online serving (`python -m triskele.eval serve`): the predictor behind the Open Inference
Protocol v2 over HTTP. `protocol` (requests and responses as bytes and arrays), `inputs` (tensors
to records through the domain's predict reader, and back), `batcher` (dynamic batching on the
compiled sizes, one device thread), `metrics` (Prometheus), `app` (the routes, token, limits,
access log), `server` (loading, warm-up, uvicorn, the drain on SIGTERM)."""
