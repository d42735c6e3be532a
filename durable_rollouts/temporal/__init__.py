"""The client side of Temporal: connection, data converter, payload codec and external storage."""
