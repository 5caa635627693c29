# Commit the snapshot in /testbed reproducibly, check it is the base commit,
# run the install commands, and keep their by-products out of `git status`.
# Filled in by swe_debug/images.py: @BASE_COMMIT@, @VERIFY@, @INSTALL@.
cd /testbed
export GIT_AUTHOR_NAME=swe GIT_AUTHOR_EMAIL=swe@vf-sandbox GIT_COMMITTER_NAME=swe GIT_COMMITTER_EMAIL=swe@vf-sandbox
export GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z"
rm -rf .git
git init -q -b main
git config --global --add safe.directory /testbed
git config --global core.fileMode false
git add -A -f
git commit -q --no-gpg-sign -m base
head=$(git rev-parse HEAD)
if [ "@VERIFY@" = 1 ] && [ "$head" != "@BASE_COMMIT@" ]; then
  echo "snapshot commit $head != base_commit @BASE_COMMIT@" >&2; exit 3
fi
@INSTALL@
git status --porcelain --untracked-files=all | sed -n 's/^?? //p' >> .git/info/exclude
test -z "$(git status --porcelain)" || { echo "install changed tracked files:" >&2; git status --porcelain >&2; exit 4; }
