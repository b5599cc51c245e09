# Fingerprints do not depend on the database encoding: canonical JSON is
# UTF-8, so a WIN1252 database must give the same fingerprint as a UTF8 one
# (and as a client computing it), even where the encodings' byte orders
# disagree ("\u20ac" is byte 0x80 in WIN1252, before "\u00e9" at 0xE9, but
# U+00E9 sorts before U+20AC).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest qw(new_idem_node);

my $node = new_idem_node('fingerprint_encoding');

# the C locale accepts every encoding, whatever the cluster's locale
for my $enc ('UTF8', 'WIN1252')
{
	$node->safe_psql('postgres',
		"CREATE DATABASE fp_" . lc($enc) . " ENCODING '$enc' TEMPLATE template0 "
		  . "LC_COLLATE 'C' LC_CTYPE 'C'");
	$node->safe_psql("fp_" . lc($enc), 'CREATE EXTENSION idempotency');
}

# everything below is ASCII: the non-ASCII characters are escapes
my $doc =
  q{'{"\u20ac": "euro", "\u00e9": "e", "a": ["\u20ac\u00e9"], "drop\u00e9": 1}'::jsonb};
my $ignore = q{ARRAY[U&'/drop\00e9']};
my $canonical = q{U&'{"a":["\20ac\00e9"],"\00e9":"e","\20ac":"euro"}'};

my $expected = $node->safe_psql('fp_utf8',
	"SELECT encode(sha256(convert_to($canonical, 'UTF8')), 'hex')");
like($expected, qr/^[0-9a-f]{64}$/, 'expected hash computed');

for my $enc ('UTF8', 'WIN1252')
{
	is( $node->safe_psql("fp_" . lc($enc),
			"SELECT encode(idem_fingerprint($doc, $ignore), 'hex')"),
		$expected,
		"$enc: fingerprint is the SHA-256 of the UTF-8 canonical text");
	is( $node->safe_psql("fp_" . lc($enc),
			"SELECT idem_canonical($doc, $ignore) = $canonical"),
		't', "$enc: canonical text, in UTF-16 member order");
	is( $node->safe_psql("fp_" . lc($enc),
			"SELECT encode(sha256(convert_to(idem_canonical($doc, $ignore), 'UTF8')), 'hex')"),
		$expected, "$enc: the canonical text converted to UTF-8 hashes to it");
}

# a canonical text that would pass 1 GB, the most a text value holds (180
# million control characters, six bytes each), is refused with 54000 and a
# hint (here, not in sql/fingerprint: make check-valgrind runs those)
my ($ret, $out, $err) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT length(idem_canonical(to_jsonb(repeat(chr(1), 180000000))));");
like($err, qr/ERROR:  54000: canonical text of the request is too large/,
	'a canonical text over 1 GB: 54000');
like($err, qr/HINT:  idem_fingerprint hashes the request without building its text/,
	'with a hint');

$node->stop;
done_testing();
