"""The input pipeline every domain shares: the global-order loader, image reading, bad records.
A domain's own data lives in its folder under `triskele.train.domains`."""
