"""The node's HTTP APIs: thin handlers over the runtime and ``KvService``, one convention
(``http``). They import the runtime; the runtime imports none of them."""
