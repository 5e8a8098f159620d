"""Never finishes: check's --timeout must end it."""

import time

while True:
    time.sleep(1)
