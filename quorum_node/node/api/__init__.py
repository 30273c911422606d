"""The node's APIs: thin handlers over the runtime and ``KvService``, the HTTP ones with one
convention (``http``), and the binary client protocol's stream (``stream``). They import the
runtime; the runtime imports none of them."""
