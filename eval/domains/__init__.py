"""Each domain's evaluation artifacts and predict reader/writer, one module per domain; a domain's
spec (`triskele.train.domains`) names its module here, and nothing else imports one."""
