"""The data model: records.py (the frozen dataclasses the core hands out), terms.py (the closed
vocabularies: statuses, kinds, layout names) and checks.py (judging helpers the layouts share).
Light on purpose: `kcache --help` reads the layout names in terms.py and nothing else here."""
