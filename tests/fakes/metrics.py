"""Reading a Prometheus exposition as the tests compare it: every sample by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[tuple[str, Labels], float]


def samples(exposition: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
