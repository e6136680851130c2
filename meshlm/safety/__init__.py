"""Safety alignment: behaviour spec, data synthesis, judges, red teaming, evaluation and the align pipeline."""
