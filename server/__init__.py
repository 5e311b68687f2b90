"""feedlog's gRPC services, installed as `feedlog_server` (the repository folder is `server/`).

    feeds   the `Feeds` service: a peer hosting many feeds (host.py, service.py,
            group_commit.py, follower.py), started by `feedlog serve`

Servicers only translate between the wire and the library (`feedlog`).
"""
