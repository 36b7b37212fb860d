"""A spec becomes a resolved experiment: spec, plan, submit, pins, harness locks, model policy."""
