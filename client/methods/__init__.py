"""One module per method with client-side work; each defines ``METHOD`` (``client.plugins``)."""
