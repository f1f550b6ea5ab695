"""Client plug-ins: each method's client-side work, one module per method (``client.plugins.base``
says what a plug-in is, ``client.plugins.registry`` finds them)."""
