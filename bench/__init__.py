"""The load benchmark behind ``make bench``: see bench/README.md and docs/PERFORMANCE.md."""
