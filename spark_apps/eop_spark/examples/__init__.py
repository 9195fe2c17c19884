"""Example transforms: counting ad impressions exactly once (see impressions.py and *.yaml)."""
