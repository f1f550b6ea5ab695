"""Figures and tables from finished (or running) run directories: what ``report.py`` writes."""
