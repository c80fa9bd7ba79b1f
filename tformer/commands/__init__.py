"""One small module per `tformer <command>`: it declares its arguments (`add_parser`), calls the public API
(tformer.api and the library) and formats the result (`run`). Heavy imports happen inside `run`, so
`tformer --help` answers at once."""
