"""Tests of apps/kiosk and its data generator."""
