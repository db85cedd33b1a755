"""Repository tools (``make upstream``, the citation check): stdlib only, run with any Python 3.10+.

A package so that tests can import them (``from tools.fetch_upstream import ensure_upstream``)
once the repository root is on ``sys.path``; each tool also runs as a plain script.
"""
