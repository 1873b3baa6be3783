"""Tests of the pages in docs/ and README.md: their links and the command lines they show."""
