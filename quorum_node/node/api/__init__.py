"""The node's client protocols over HTTP and WebSocket."""
