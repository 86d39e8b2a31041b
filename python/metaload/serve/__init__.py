"""metaload serve: nnsight's remote runs on your own machines, keyed by the model key.

    python -m metaload.serve org/name --port 8080        # or: metaload serve org/name
    with model.trace("Hello", remote="http://127.0.0.1:8080"):
        h = model.transformer.h[0].output.save()

Each REF is a deployment built by nnsight's own wrapper with metaload's integration on
(metaload.enable_nnsight), in an executor process of its own; requests run through nnsight's
server-side API (RequestModel.deserialize, tracer.execute). A request is code that runs with the
server's rights: give keys (--api-keys) only to people you would give a shell.
Modules: cli (the command line), app (the HTTP front), deployment (queue and executor
supervision), executor (the process that runs requests), keys (which deployment a key names),
store (statuses and results kept for clients).
"""
