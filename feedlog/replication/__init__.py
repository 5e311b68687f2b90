"""Feeds over the network: the wire format, verification of what peers send, and the client.

The peer side (the gRPC services) is `feedlog_server`; everything here is
usable without a server running, and imports no server code.
"""
