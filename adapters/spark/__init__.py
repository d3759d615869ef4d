"""Spark batch jobs: index large profile sets, replay sensor feeds per key, profile statistics.

Everything here runs on one machine in local mode (`local[2]`) as well as on a
cluster; the engine itself is unchanged — Spark only decides which events each
engine sees and merges what the engines report.
"""
