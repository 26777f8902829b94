// What both console pages (console.html, replay.html) share: the sign-in form and the
// error bar. The key is checked by one call before it is kept; a key the server refuses
// later (401: taken off the server's list) signs the tab out with the server's message.
import { Api, ApiError, describeError, keyStore } from './console-api.js';

const $ = (id) => document.getElementById(id);

export class Page {
  // onSignIn(api): the key was accepted; onSignOut(): stop whatever runs with it.
  constructor({ onSignIn, onSignOut }) {
    this.onSignIn = onSignIn;
    this.onSignOut = onSignOut;
    this.keys = keyStore(window.sessionStorage);
    this.api = null;
    this.ui = {
      signIn: $('sign-in'), form: $('sign-in-form'), key: $('key'), signInError: $('sign-in-error'),
      app: $('app'), signOut: $('sign-out'), error: $('error'), errorText: $('error-text'),
      errorClose: $('error-close'),
    };
    this.ui.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.submit();
    });
    this.ui.signOut.addEventListener('click', () => this.signOut());
    this.ui.errorClose.addEventListener('click', () => this.clearError());
  }

  start() {
    const key = this.keys.get();
    if (key) this.enter(this.apiFor(key));
    else this.showSignIn('');
  }

  apiFor(key) {
    return new Api({ key, fetch: window.fetch.bind(window) });
  }

  async submit() {
    const key = this.ui.key.value.trim();
    if (!key) return;
    const button = this.ui.form.querySelector('button[type=submit]');
    button.disabled = true;
    const api = this.apiFor(key);
    try {
      await api.json('GET', '/v1/sessions?state=running');
    } catch (error) {
      this.showSignIn(describeError(error));
      return;
    } finally {
      button.disabled = false;
    }
    this.keys.set(key);
    this.ui.key.value = '';
    this.enter(api);
  }

  enter(api) {
    this.api = api;
    this.ui.signIn.hidden = true;
    this.ui.signInError.hidden = true;
    this.ui.app.hidden = false;
    this.ui.signOut.hidden = false;
    this.onSignIn(api);
  }

  signOut(message = '') {
    this.keys.clear();
    this.api = null;
    this.clearError();
    this.onSignOut();
    this.showSignIn(message);
  }

  showSignIn(message) {
    this.ui.app.hidden = true;
    this.ui.signOut.hidden = true;
    this.ui.signIn.hidden = false;
    this.ui.signInError.textContent = message;
    this.ui.signInError.hidden = !message;
    this.ui.key.focus();
  }

  // A failed call: `what` was being done. A refused key ends the sign-in.
  fail(what, error) {
    if (error instanceof ApiError && error.status === 401) {
      this.signOut(describeError(error));
      return;
    }
    this.showError(`${what}: ${describeError(error)}`);
  }

  showError(text) {
    this.ui.errorText.textContent = text;
    this.ui.error.hidden = false;
  }

  clearError() {
    this.ui.error.hidden = true;
    this.ui.errorText.textContent = '';
  }
}

// A file behind the bearer header (a recording's video or export): a plain link could not
// send the key, so it is fetched and handed to the browser's download as a blob.
export async function saveAs(api, path, name) {
  const url = URL.createObjectURL(await api.blob(path));
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
