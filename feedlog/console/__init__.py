"""`feedlog console`: read-only web pages over the feeds and tables one operator configured.

catalog (what is shown: feeds and tables, addressed by their index in the configured set, never
by a path from a URL) · reads (each page's data, from the same library functions the CLI's
`--json` prints) · pages (the ASGI app: routes, templates, the security headers, GET/HEAD only,
the token check) · serve (`feedlog console`'s arguments and the listener). Needs the `console`
extra (Starlette, uvicorn, Jinja2; matplotlib draws the activity).
"""
