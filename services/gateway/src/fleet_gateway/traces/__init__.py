"""Traces of turns, folded from the log: the span tree (`tree`), its OTLP/JSON form (`otlp`),
reading a session's events (`reading`) and the live OTLP export (`export`)."""
