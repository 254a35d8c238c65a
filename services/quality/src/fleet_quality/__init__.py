"""The quality service: datasets, evaluation, GEPA optimization, promotion drafts.

Answers ping only until its own issue. Will consume `fleet.work.quality.*` and emit
`fleet.quality.*` events.
"""
