"""The process: web app, webhook intake, worker, services, and what runs beside them."""
