"""What commcamp reads and checks: site.yaml, campaign specs and their test cases, sizes, commbench records, the
op/transport/metric vocabulary, YAML with file:line errors."""
