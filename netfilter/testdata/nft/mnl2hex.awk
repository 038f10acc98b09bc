# Turns `nft --debug=mnl` dumps into one line per message: "type flags hex-payload".
function hex16le(v) { return sprintf("%02x%02x", v % 256, int(v / 256)); }
BEGIN { inmsg = 0 }
{ gsub(/\x1b\[[0-9;]*m/, "") }
/\| message length \|/ { if (inmsg) print type, payload; match($0, /[0-9]+/); payload = ""; inmsg = 1; next }
/\|  type \| flags  \|/ { match($0, /[0-9]+/); type = substr($0, RSTART, RLENGTH); next }
/\|len \|flags\| type\|/ {
  split($0, f, "|"); len = f[2] + 0; fl = f[3]; ty = f[4] + 0;
  if (fl ~ /N/) ty += 32768; if (fl ~ /B/) ty += 16384;
  payload = payload hex16le(len) hex16le(ty); next }
/\|  extra header  \|/ || /\|      data      \|/ {
  split($0, f, "|"); s = f[2]; gsub(/ /, "", s); payload = payload s; next }
END { if (inmsg) print type, payload }
