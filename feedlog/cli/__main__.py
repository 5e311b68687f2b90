from . import entrypoint

entrypoint()
